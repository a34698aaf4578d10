"""What is measured: the history record a training run fills, memory and bytes per device, the step profile,
state checksums and the matmul peak. Imports only the process utilities."""
