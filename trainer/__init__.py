"""The reference DDP trainer (`burnrate train`, `python -m burnrate.trainer`) and the monitor any
training loop can use to report to the burnrate agent (`burnrate.monitor.Monitor`)."""
