-- The same logical schema as postgres/0001_event_store.sql. Timestamps are
-- INTEGER microseconds since the Unix epoch, JSON is TEXT in canonical form,
-- ids are TEXT in their hyphenated form.

CREATE TABLE es_control (
    id               INTEGER PRIMARY KEY CHECK (id = 1),
    last_position    INTEGER NOT NULL DEFAULT 0 CHECK (last_position >= 0),
    last_hash        BLOB    NOT NULL DEFAULT (zeroblob(32)),
    epoch            INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    holder           TEXT,
    lease_expires_at INTEGER NOT NULL DEFAULT 0
) STRICT;
INSERT INTO es_control (id) VALUES (1);

CREATE TABLE es_streams (
    stream_id TEXT    PRIMARY KEY,
    version   INTEGER NOT NULL CHECK (version > 0)
) STRICT, WITHOUT ROWID;

CREATE TABLE es_events (
    position       INTEGER PRIMARY KEY CHECK (position > 0),
    stream_id      TEXT    NOT NULL,
    stream_version INTEGER NOT NULL CHECK (stream_version > 0),
    event_id       TEXT    NOT NULL UNIQUE,
    event_type     TEXT    NOT NULL,
    schema_version INTEGER NOT NULL CHECK (schema_version > 0),
    payload        TEXT    NOT NULL,
    metadata       TEXT    NOT NULL,
    epoch          INTEGER NOT NULL,
    recorded_at    INTEGER NOT NULL,
    hash           BLOB    NOT NULL,
    UNIQUE (stream_id, stream_version)
) STRICT;
CREATE INDEX es_events_recorded_at ON es_events (recorded_at);

CREATE TABLE es_checkpoints (
    name       TEXT    PRIMARY KEY,
    position   INTEGER NOT NULL CHECK (position >= 0),
    event_id   TEXT,
    updated_at INTEGER NOT NULL
) STRICT;

-- SQLite has no TRUNCATE: a DELETE without WHERE still fires these.
CREATE TRIGGER es_events_no_update BEFORE UPDATE ON es_events
BEGIN
    SELECT RAISE(ABORT, 'es_events is append-only: UPDATE refused');
END;
CREATE TRIGGER es_events_no_delete BEFORE DELETE ON es_events
BEGIN
    SELECT RAISE(ABORT, 'es_events is append-only: DELETE refused');
END;
CREATE TRIGGER es_control_forward BEFORE UPDATE ON es_control
WHEN NEW.last_position < OLD.last_position OR NEW.epoch < OLD.epoch
BEGIN
    SELECT RAISE(ABORT, 'es_control only moves forward');
END;
CREATE TRIGGER es_control_keep BEFORE DELETE ON es_control
BEGIN
    SELECT RAISE(ABORT, 'es_control is append-only: DELETE refused');
END;
