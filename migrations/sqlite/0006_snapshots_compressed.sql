-- See postgres/0006_snapshots_compressed.sql. SQLite cannot change a
-- column's type, so the table is made again.
DROP TABLE es_snapshots;
CREATE TABLE es_snapshots (
    name          TEXT    PRIMARY KEY,
    position      INTEGER NOT NULL CHECK (position >= 0),
    event_id      TEXT,
    state_version INTEGER NOT NULL,
    state         BLOB    NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
