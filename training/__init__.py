"""Training the models this service serves: data mined from public history, adapters."""
