"""`vllm.general_plugins` entry point: registers HiStateConnector by name."""


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "HiStateConnector" not in KVConnectorFactory._registry:  # register_connector raises on dup
        KVConnectorFactory.register_connector(
            "HiStateConnector", "histate_vllm.connector", "HiStateConnector"
        )
