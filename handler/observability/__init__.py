"""What an instance says about itself: logs, metrics (EMF, Prometheus), traces, the init report."""
