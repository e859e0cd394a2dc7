-- Where the log begins. A log imported from an export that starts after
-- position 1 (`llmgw events import --from-anchor`) begins at
-- base_position + 1, linked to base_hash: the hash its source had at
-- base_position, taken on trust. Every other log has base 0 and the genesis
-- hash. Verification starts from the base; it is set once, in the
-- transaction that writes the log's first events, and never changes after.
ALTER TABLE es_control
    ADD COLUMN base_position bigint NOT NULL DEFAULT 0 CHECK (base_position >= 0),
    ADD COLUMN base_hash     bytea  NOT NULL DEFAULT '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;

CREATE FUNCTION es_control_base_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.last_position > 0 AND (NEW.base_position <> OLD.base_position
                                  OR NEW.base_hash <> OLD.base_hash) THEN
        RAISE EXCEPTION 'es_control: where the log begins is fixed once it holds events'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER es_control_base BEFORE UPDATE ON es_control
    FOR EACH ROW EXECUTE FUNCTION es_control_base_fixed();
