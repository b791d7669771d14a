"""The LLM graphs: which path through the components each one takes (``.link()``)."""
