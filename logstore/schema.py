"""The ClickHouse schema as an ordered list of idempotent migrations."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "events",
        (
            """
            CREATE TABLE IF NOT EXISTS events (
                ts DateTime64(3, 'UTC'),
                session_id String,
                user_id UInt64,
                item_id UInt64,
                category_id UInt16,
                brand_id UInt32,
                device_type UInt8,
                hour UInt8,
                weekday UInt8,
                position UInt8,
                region_id UInt8,
                price Float32,
                discount_pct Float32,
                item_rating Float32,
                item_review_count Float32,
                item_age_days Float32,
                item_ctr_7d Float32,
                item_impressions_7d Float32,
                user_age Float32,
                user_tenure_days Float32,
                user_clicks_30d Float32,
                user_orders_30d Float32,
                user_ctr_30d Float32,
                user_avg_price Float32,
                user_category_affinity Float32,
                session_depth Float32,
                session_duration_s Float32,
                seconds_since_last_click Float32,
                price_to_user_avg Float32,
                clicked UInt8
            ) ENGINE = MergeTree ORDER BY (ts, user_id)
            """,
        ),
    ),
    Migration(
        2,
        "inference_logs, user_sessions, release_events",
        (
            """
            CREATE TABLE IF NOT EXISTS inference_logs (
                ts DateTime64(3, 'UTC'),
                request_id String,
                user_id UInt64,
                session_id String,
                slot LowCardinality(String),
                model_version String,
                lineage_id String,
                latency_ms Float32,
                queue_ms Float32,
                preprocess_ms Float32,
                compute_ms Float32,
                postprocess_ms Float32,
                batch_size UInt16,
                input_bytes UInt32,
                status UInt16,
                error_code LowCardinality(String)
            ) ENGINE = MergeTree ORDER BY (ts, slot)
            """,
            """
            CREATE TABLE IF NOT EXISTS user_sessions (
                session_id String,
                user_id UInt64,
                started_at DateTime64(3, 'UTC'),
                user_age Float32,
                device_type LowCardinality(String),
                session_length_s Float32,
                orders UInt16,
                gmv Float64
            ) ENGINE = MergeTree ORDER BY (started_at, session_id)
            """,
            """
            CREATE TABLE IF NOT EXISTS release_events (
                ts DateTime64(3, 'UTC'),
                release_id String,
                model_version String,
                lineage_id String,
                kind LowCardinality(String),
                verdict LowCardinality(String),
                reason String,
                details String
            ) ENGINE = MergeTree ORDER BY (ts, release_id)
            """,
        ),
    ),
    Migration(
        3,
        "inference_logs: rows and trace_id",
        (
            # The request's candidate rows (what heavier requests change) and its trace: a slow
            # row leads to its trace, a trace to its row. Rows written before keep 0 and ''.
            "ALTER TABLE inference_logs ADD COLUMN IF NOT EXISTS rows UInt32 DEFAULT 0",
            "ALTER TABLE inference_logs ADD COLUMN IF NOT EXISTS trace_id String DEFAULT ''",
        ),
    ),
    Migration(
        4,
        "impressions, feedback",
        (
            # One row per candidate the fleet scored and returned: the 27 features exactly as
            # the model saw them, the rank its score gave the item (where the shopper sees it),
            # and which model and slot served it.
            """
            CREATE TABLE IF NOT EXISTS impressions (
                ts DateTime64(3, 'UTC'),
                request_id String,
                rank UInt16,
                slot LowCardinality(String),
                model_version String,
                lineage_id String,
                session_id String,
                score Float32,
                -- categorical features as the request carried them (the model hashes or clips them)
                user_id UInt64,
                item_id UInt64,
                category_id UInt64,
                brand_id UInt64,
                device_type UInt64,
                hour UInt64,
                weekday UInt64,
                position UInt64,
                region_id UInt64,
                price Float32,
                discount_pct Float32,
                item_rating Float32,
                item_review_count Float32,
                item_age_days Float32,
                item_ctr_7d Float32,
                item_impressions_7d Float32,
                user_age Float32,
                user_tenure_days Float32,
                user_clicks_30d Float32,
                user_orders_30d Float32,
                user_ctr_30d Float32,
                user_avg_price Float32,
                user_category_affinity Float32,
                session_depth Float32,
                session_duration_s Float32,
                seconds_since_last_click Float32,
                price_to_user_avg Float32
            ) ENGINE = MergeTree ORDER BY (ts, request_id)
            """,
            # What users did with an impression, keyed by request id and item. Production click
            # streams may insert here directly; feedback_id makes each row's origin traceable.
            """
            CREATE TABLE IF NOT EXISTS feedback (
                ts DateTime64(3, 'UTC'),
                feedback_id String,
                request_id String,
                item_id UInt64,
                event LowCardinality(String),
                order_value Float64
            ) ENGINE = MergeTree ORDER BY (request_id, item_id, ts)
            """,
        ),
    ),
    Migration(
        5,
        "shadow_pairs",
        (
            # One row per request stable answered that the canary slot also scored in shadow
            # (serving.shadow): both latencies and both top-k answers, keyed by request id. The
            # shadow's answer reached no user; shadow_error is its error code ('' = scored).
            """
            CREATE TABLE IF NOT EXISTS shadow_pairs (
                ts DateTime64(3, 'UTC'),
                request_id String,
                user_id UInt64,
                stable_version String,
                candidate_version String,
                stable_latency_ms Float32,
                shadow_latency_ms Float32,
                shadow_error LowCardinality(String),
                candidates UInt16,
                stable_top_k Array(UInt64),
                shadow_top_k Array(UInt64)
            ) ENGINE = MergeTree ORDER BY (ts, request_id)
            """,
        ),
    ),
)
