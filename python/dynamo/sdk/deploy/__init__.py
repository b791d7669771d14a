"""From a graph to a cluster: the graph resolved for deployment (``graph``), the built
artifact (``artifact``), the Kubernetes manifests (``kubernetes``, ``platform``,
``lifecycle``) and applying them (``apply``). ``dynamo build`` and ``dynamo deploy``
(``dynamo.sdk.cli``) are thin shells over these modules."""
