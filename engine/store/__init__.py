"""The store: everything Mode Lab keeps, in one DuckDB file.

db (the database, its schema and migrations, run and metric records, the queries pages and features share), envinfo
(the environment captured with every run), merge (another store's runs brought in, ids remapped), report (tables
built from the store: summaries and speedups). The lowest layer: it imports nothing else of the engine.
"""
