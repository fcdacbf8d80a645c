"""gRPC plumbing: servers and channels, what every interceptor needs, the decode guard, the stream send
timeout, the tenant routing header and the stubs' generation."""
