"""The gateway's state store: stored responses (the Responses API's conversations) and usage
records, in SQLite (one gateway) or PostgreSQL (several replicas sharing it), through
SQLAlchemy's async engine, its schema kept by versioned Alembic migrations applied when a gateway
starts."""
