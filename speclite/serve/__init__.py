"""`speclite serve`: an OpenAI-compatible HTTP server around one LLM (extra `speclite[serve]`)."""
