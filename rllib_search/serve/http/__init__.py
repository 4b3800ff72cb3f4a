"""What the HTTP services and their clients share: request validation, a retrying client, free ports."""
