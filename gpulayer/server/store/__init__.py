"""The state file: apsw connections, schema, migrations, named queries, the one writer; the artifact file store."""
