-- Snapshots of in-memory projections: the view's state as of a checkpoint,
-- so that a restart replays only the log's tail. A cache, never the truth:
-- one whose state_version or event id no longer matches is ignored.
CREATE TABLE es_snapshots (
    name          text        PRIMARY KEY,
    position      bigint      NOT NULL CHECK (position >= 0),
    event_id      uuid,
    state_version integer     NOT NULL,
    state         jsonb       NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
