"""``tidemesh mcp``: the MCP server through which AI coding sessions use the mesh.

Layout: ``tools`` lists the ``mesh_`` tools as data; ``handlers`` answers them through the
SDK (``tidemesh.client``); ``push`` pushes each message for the session as a channel
notification; ``server`` wires them to the ``mcp`` SDK on stdio; ``install`` writes the MCP
configuration of the clients people use. Needs the ``[mcp]`` extra (the ``mcp`` package).
"""
