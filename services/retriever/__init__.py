"""The retriever: documents and past sessions in, grounded prompts out.

Library (no gRPC):   core.RetrieverCore(settings.RetrieverSettings(...)) -> ingest / delete / retrieve / stats,
                     core.sessions is the GenerationCompleted applier (apply / snapshot / restore),
                     doc_applier.DocumentsApplier(core.documents) the DocumentChanged one.
Replication:         doc_writer.DocumentWriter(core, bus): Ingest/Delete publish document events,
                     every replica applies them (build.wire_retriever subscribes both appliers).
gRPC service:        servicer.serve(core, port) -> (server, port); stop with common.grpcutil.stop_server.
Client:              ingest_cli.main(argv) (``lookahead-rag ingest``).
Bundled corpus:      corpus.bundled_corpus_path(), corpus.sample_questions_path().

Modules, one idea each: chunking (offsets), documents (records), ingest (file readers), embeddings
(MiniLM), vector_cache (precomputed vectors), index (one tenant's FAISS + id map), atomic + store
(crash-safe files), sessions (past Q/A), prompt (budgeted chat prompt), stdlib_corpus (generator),
tenants (every tenant's index; the one apply path), doc_events (document changes, pure), doc_applier
and doc_writer (the two ends of document replication).
"""
