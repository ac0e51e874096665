"""The environment variables the client container reads.

The run-manager hands its whole env file to the client container (as Psyche's
`docker run --env-file` does), so a variable there is meant either for the run-manager
or for the client. These are the client's: its options' upper-snake names and the few it
reads directly. `tests/client_runtime/test_client_cli.py` keeps this list equal to the
client CLI's; the run-manager warns about env-file keys that neither side reads.
"""

from __future__ import annotations

CLIENT_OPTION_VARIABLES = frozenset({
    "ACTIVATION_CHECKPOINTING", "AUTHORIZER", "BIND_P2P_INTERFACE", "BIND_P2P_PORT", "CHECKPOINT_DIR",
    "DATA_PARALLELISM", "DELETE_OLD_STEPS", "DEVICE", "DTYPE", "DUMMY_TRAINING_DELAY_SECS",
    "EVAL_DATA_DIR", "EVAL_SEED", "EVENTS_DIR",
    "EVAL_TASK_MAX_DOCS", "EVAL_TASKS", "GCS_BUCKET", "GCS_PREFIX", "HUB_REPO", "IDENTITY_SECRET_KEY_PATH",
    "IROH_DISCOVERY", "IROH_RELAY", "KEEP_EVENT_FILES", "KEEP_STEPS", "LOCAL_RANKS", "LOGS", "MAX_CONCURRENT_PARAMETER_REQUESTS",
    "MAX_MODEL_DOWNLOAD_MBPS", "MAX_UPLOAD_MBPS",
    "METRICS_LOCAL_PORT", "MICRO_BATCH_SIZE", "OLTP_AUTH_HEADER", "OLTP_LOGS_URL",
    "OLTP_METRICS_URL", "OLTP_REPORT_INTERVAL", "OLTP_TRACING_URL", "OTLP_AUTH_HEADER",
    "OTLP_LOGS_URL", "OTLP_METRICS_URL", "OTLP_REPORT_INTERVAL", "OTLP_TRACING_URL",
    "PROMETHEUS_HOST", "PROMETHEUS_PORT", "PROMPT_TASK", "PSYCHE_MAIN_HOST", "PSYCHE_MAIN_PORT",
    "PSYCHE_START_RANK", "PSYCHE_WORLD_SIZE", "REPLAY_CLASS", "RPC", "RPC_2", "RPC_3", "RUN_ID", "SERVER_ADDR",
    "TENSOR_PARALLELISM", "TORCH_THREADS", "WALLET_PRIVATE_KEY_PATH", "WRITE_GRADIENTS_DIR",
    "WANDB_ENTITY", "WANDB_GROUP", "WANDB_PROJECT", "WANDB_RUN", "WS_RPC", "WS_RPC_2", "WS_RPC_3",
})
CLIENT_DIRECT_VARIABLES = frozenset({
    "CLIENT_VERSION", "HF_TOKEN", "RAW_IDENTITY_SECRET_KEY", "RAW_WALLET_PRIVATE_KEY",
    "DEPLOYMENT_ENV", "GOOGLE_APPLICATION_CREDENTIALS",
})
# Read by the libraries inside the container (torch, NCCL, CUDA, the Hub, iroh's logging,
# google-cloud-storage's emulator address, W&B's key and mode).
LIBRARY_PREFIXES = ("CUDA_", "NCCL_", "NVIDIA_", "HF_", "HUGGINGFACE_", "PYTORCH_", "TORCH_",
                    "OMP_", "MKL_", "RUST_", "OTEL_", "PYTHON", "TRANSFORMERS_",
                    "STORAGE_EMULATOR_HOST", "WANDB_")


def read_by_client(name: str) -> bool:
    return (name in CLIENT_OPTION_VARIABLES or name in CLIENT_DIRECT_VARIABLES
            or name.startswith(LIBRARY_PREFIXES))
