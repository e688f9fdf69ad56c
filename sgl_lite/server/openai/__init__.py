"""OpenAI's /v1 API: models, completions, chat with structured output and tool calling."""
