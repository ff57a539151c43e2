"""Program-aware (ThunderAgent) agent scheduling for NVIDIA Dynamo."""

__version__ = "0.1.0"
