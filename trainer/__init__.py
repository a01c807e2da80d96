"""The reference DDP trainer (`burnrate train`, `python -m trainer`) and the monitor any
training loop can use to report to the burnrate agent (`trainer.monitor.Monitor`)."""
