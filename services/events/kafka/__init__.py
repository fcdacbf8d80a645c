"""The event bus over Kafka; import what you need from its modules (this package re-exports nothing).

- ``settings``: ``KafkaSettings`` (env prefix ``LAR_KAFKA_``), imports nothing of the bus;
- ``bus``: ``KafkaBus``, the ``EventBus`` over Kafka (a publisher plus one runner per group);
- ``publisher``: ``KafkaPublisher``, publish = append to the outbox, a flusher sends it;
- ``outbox``: the durable SQLite outbox and its flusher;
- ``consumer``: ``KafkaConsumerRunner``, one group feeding one applier (apply, commit, snapshot);
- ``record_handler``: one record into one applier, dead-lettering what cannot be applied;
- ``dead_letter``: the dead-letter topic's sender and headers;
- ``state``: the snapshot + offsets file a runner recovers from;
- ``cluster_offsets``: the cluster id, a topic's partitions and end offsets;
- ``broker``: the bundled tansu broker (``lookahead-rag broker``) and ``ensure_topics``.
"""
