"""The books the connector and the trace simulator share; imports neither vllm nor torch.

`orchestration` (which key is in which tier, DRAM slots, SSD copies), `restore_admission`
(restores sized to the free GPU blocks), `rank_reports` (SSD write outcomes across ranks),
`telemetry` (counts and miss causes), `eventlog` (the on-disk event log) and `log_inspect`
(`python -m histate_vllm inspect`). tests/test_layers.py checks the import rule.
"""
