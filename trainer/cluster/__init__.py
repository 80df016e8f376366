"""The cluster a task belongs to: TF_CONFIG parsed into a spec, every target's address template, the
peers' preflight, the gRPC server settings, the agreement check, the device line, the JobSet entry."""
