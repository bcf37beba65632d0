"""imexctl.conf: the schema, its one reader, the typed settings, the config file lookup and this node's paths."""
