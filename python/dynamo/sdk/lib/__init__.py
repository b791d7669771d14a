"""Helpers services use at run time (``dynamo.sdk.lib.config.ServiceConfig``)."""
