"""The state file: apsw connections, schema, migrations, named queries, the one writer."""
