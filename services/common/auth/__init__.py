"""Who may call: callers bound to tenants (API keys, client-certificate subjects), keys, scopes, the gRPC
interceptor that checks every call, and transport security (TLS)."""
