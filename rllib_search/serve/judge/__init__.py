"""R-Search's evidence judge: the Serve deployment (an OpenAI-compatible subset) and its client."""
