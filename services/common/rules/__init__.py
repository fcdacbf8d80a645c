"""What a request may ask for, the same in every service: limits, per-tenant quotas, a conversation's
checks and turns, and the model's context window."""
