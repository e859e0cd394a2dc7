-- See postgres/0002_snapshots.sql.
CREATE TABLE es_snapshots (
    name          TEXT    PRIMARY KEY,
    position      INTEGER NOT NULL CHECK (position >= 0),
    event_id      TEXT,
    state_version INTEGER NOT NULL,
    state         TEXT    NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
