"""The engine's config: loading (JSON/YAML/dict), the schema with every field's doc, checks. Torch-free."""
