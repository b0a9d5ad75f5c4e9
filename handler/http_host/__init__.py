"""The HTTP host (SageMaker, Cloud Run, Knative): routes, server, host settings, the drain."""
