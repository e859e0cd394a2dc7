-- The event log, its head and append lease, stream versions and projection
-- checkpoints. See ARCHITECTURE.md, "The event store".

-- Exactly one row: the head of the log, the head of the hash chain and the
-- append lease. Every append locks this row, which serialises appends, makes
-- positions dense and keeps position order equal to commit order.
CREATE TABLE es_control (
    id               smallint    PRIMARY KEY CHECK (id = 1),
    last_position    bigint      NOT NULL DEFAULT 0 CHECK (last_position >= 0),
    last_hash        bytea       NOT NULL DEFAULT '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
    epoch            bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    holder           text,
    lease_expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO es_control (id) VALUES (1);

CREATE TABLE es_streams (
    stream_id text   PRIMARY KEY,
    version   bigint NOT NULL CHECK (version > 0)
);

CREATE TABLE es_events (
    position       bigint      PRIMARY KEY CHECK (position > 0),
    stream_id      text        NOT NULL,
    stream_version bigint      NOT NULL CHECK (stream_version > 0),
    event_id       uuid        NOT NULL UNIQUE,
    event_type     text        NOT NULL,
    schema_version integer     NOT NULL CHECK (schema_version > 0),
    payload        jsonb       NOT NULL,
    metadata       jsonb       NOT NULL,
    epoch          bigint      NOT NULL,
    recorded_at    timestamptz NOT NULL,
    hash           bytea       NOT NULL,
    UNIQUE (stream_id, stream_version)
);
-- Append-only and written in time order: a BRIN index costs next to nothing
-- to maintain and still narrows a time-range read to the right pages.
CREATE INDEX es_events_recorded_at ON es_events USING brin (recorded_at);

CREATE TABLE es_checkpoints (
    name       text        PRIMARY KEY,
    position   bigint      NOT NULL CHECK (position >= 0),
    event_id   uuid,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The log is immutable: nothing updates, deletes or truncates an event.
CREATE FUNCTION es_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER es_events_immutable BEFORE UPDATE OR DELETE ON es_events
    FOR EACH ROW EXECUTE FUNCTION es_refuse_change();
CREATE TRIGGER es_events_no_truncate BEFORE TRUNCATE ON es_events
    FOR EACH STATEMENT EXECUTE FUNCTION es_refuse_change();

-- The head and the epoch never move backwards, and the control row stays.
CREATE FUNCTION es_control_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_position < OLD.last_position OR NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'es_control only moves forward'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER es_control_forward BEFORE UPDATE ON es_control
    FOR EACH ROW EXECUTE FUNCTION es_control_forward_only();
CREATE TRIGGER es_control_keep BEFORE DELETE ON es_control
    FOR EACH ROW EXECUTE FUNCTION es_refuse_change();
CREATE TRIGGER es_control_no_truncate BEFORE TRUNCATE ON es_control
    FOR EACH STATEMENT EXECUTE FUNCTION es_refuse_change();
