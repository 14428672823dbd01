"""Pigeon: a durable publish/subscribe and task-queue server speaking the Pub/Sub v1 API."""

__version__ = "0.1.0"
