"""Several front-end processes and one writer (`gpulayer server start --front-ends N`, N > 1).

docs/architecture.md, "When one machine is not enough", step 2: a supervisor (the `server start` process,
supervisor.py) holds the home's lock and the port, and starts one writer process (writer.py: the Store's writer
thread, upkeep, notifications, provisioning, replication) and N front ends (frontend.py: granian and the falcon
app over their own read connections). A front end's writes travel to the writer as named operations over a
Unix socket (codec.py: no code travels; client.py the front end's end, rpc.py the writer's), run in its group
commits, and come back as the result or the domain error.
"""
