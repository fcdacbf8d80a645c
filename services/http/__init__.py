"""The OpenAI-compatible HTTP front door (``/v1/chat/completions``) over the generator's engine."""
