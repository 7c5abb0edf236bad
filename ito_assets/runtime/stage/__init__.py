"""One stage of the curriculum: the manifest's stages as worker configs (`curriculum`, `config`),
the token shards they read (`corpus`), the fixed eval battery (`battery`) and the eval gate that
compares it with the previous stage (`eval_gate`)."""
