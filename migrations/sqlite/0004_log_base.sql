-- The same as postgres/0004_log_base.sql: where the log begins (base 0 and
-- the genesis hash unless it was imported from an anchor), fixed once the
-- log holds events.
ALTER TABLE es_control ADD COLUMN base_position INTEGER NOT NULL DEFAULT 0 CHECK (base_position >= 0);
ALTER TABLE es_control ADD COLUMN base_hash BLOB NOT NULL
    DEFAULT X'0000000000000000000000000000000000000000000000000000000000000000';

CREATE TRIGGER es_control_base BEFORE UPDATE ON es_control
WHEN OLD.last_position > 0
 AND (NEW.base_position IS NOT OLD.base_position OR NEW.base_hash IS NOT OLD.base_hash)
BEGIN
    SELECT RAISE(ABORT, 'es_control: where the log begins is fixed once it holds events');
END;
