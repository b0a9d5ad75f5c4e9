"""The local Lambda: Invoke API, a Runtime API per instance, real `awslambdaric` instances, zygote snapshots."""
