"""What the services tell operators: structured logs, Prometheus metric groups and the observability
interceptor, traces, and the refresher that keeps sampled gauges current."""
