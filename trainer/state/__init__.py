"""What a job leaves on disk: checkpoints and their manifests, the final export and run summary, written
crash-safe through one atomic write (atomic.py)."""
