"""What the protocol keeps durably: the registry (KeeperMap), the decision log and its
arbiters, the commit markers, the checkpoint's paths and the query's identity.
"""
