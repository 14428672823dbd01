"""`pigeon bench`: Pigeon's load generator and its side-by-side comparison with peers (RabbitMQ, NATS
JetStream, Redis Streams, Google's Pub/Sub emulator) on this machine, in one run.

    plan      sizes, durations and time bounds of every workload (smoke / quick / full)
    procs     bounded server processes, and what the machine does while they run
    workers   forked load workers that start together, the open loop's pacing
    peers     how each server is started on loopback with durable settings
    workloads publish, consume, latency, ordered, many clients, backlog memory, restart
    *_client  one lean driver per protocol (gRPC Pub/Sub, AMQP, NATS, Redis)
    run       the orchestration and its progress bars
    report    table, Markdown, JSON and PNG
    scale     the scale-out plan: a cluster at N = 3..6 nodes, each under a CPU cgroup (cgroups), and its
              report (scale_report)

This package is a client of the servers it measures: it imports nothing from pigeon.api, pigeon.node or
pigeon.broker and starts Pigeon as a separate `pigeon serve` process.
"""
