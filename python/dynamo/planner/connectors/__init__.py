"""The planner's connectors, one module each (see ``dynamo.planner.connector``)."""
