-- The read side of a new home as sqlite-utils 4.2.1's Migrations made it (sqlite_master, in order);
-- store/readmodel_schema.py makes the same text without it (tests/test_readmodels.py).

CREATE TABLE "_sqlite_migrations" (
   "id" INTEGER PRIMARY KEY,
   "migration_set" TEXT,
   "name" TEXT,
   "applied_at" TEXT
);

CREATE UNIQUE INDEX "idx__sqlite_migrations_migration_set_name"
    ON "_sqlite_migrations" ("migration_set", "name");

CREATE TABLE "job_status" (
   "job_id" TEXT PRIMARY KEY,
   "file" TEXT,
   "profile" TEXT,
   "model" TEXT,
   "state" TEXT,
   "sandbox" INTEGER,
   "rows" INTEGER,
   "requests" INTEGER,
   "chunks_total" INTEGER,
   "chunks_done" INTEGER,
   "input_tokens" INTEGER,
   "prompt_tokens" INTEGER,
   "cached_tokens" INTEGER,
   "output_tokens" INTEGER,
   "reasoning_tokens" INTEGER,
   "cost_usd" REAL,
   "estimate_usd" REAL,
   "succeeded" INTEGER,
   "failed" INTEGER,
   "error_code" TEXT,
   "error" TEXT,
   "error_stage" TEXT,
   "error_hint" TEXT,
   "last_error" TEXT,
   "held_code" TEXT,
   "held_reason" TEXT,
   "cancel_requested" INTEGER,
   "result_path" TEXT,
   "error_path" TEXT,
   "archived_path" TEXT,
   "created_ts" TEXT,
   "updated_ts" TEXT,
   "version" INTEGER,
   "cached_rows" INTEGER,
   "duplicate_rows" INTEGER,
   "saved_usd" REAL,
   "input_tokens_exact" INTEGER,
   "cache_write_tokens" INTEGER,
   "cache_saved_usd" REAL,
   "route" TEXT,
   "chunks" TEXT
);

CREATE INDEX "idx_job_status_created_ts"
    ON "job_status" ("created_ts");

CREATE TABLE "usage" (
   "seq" INTEGER PRIMARY KEY,
   "job_id" TEXT,
   "chunk" INTEGER,
   "batch_id" TEXT,
   "model" TEXT,
   "day" TEXT,
   "ts" TEXT,
   "prompt_tokens" INTEGER,
   "cached_tokens" INTEGER,
   "completion_tokens" INTEGER,
   "reasoning_tokens" INTEGER,
   "cost_usd" REAL,
   "sandbox" INTEGER,
   "cache_write_tokens" INTEGER,
   "cache_saved_usd" REAL,
   "route" TEXT
);

CREATE INDEX "idx_usage_day"
    ON "usage" ("day");

CREATE INDEX "idx_usage_job_id"
    ON "usage" ("job_id");

CREATE TABLE "projection_state" (
   "name" TEXT PRIMARY KEY,
   "last_seq" INTEGER
);

CREATE INDEX "idx_job_status_state_created_ts"
    ON "job_status" ("state", "created_ts");

CREATE TABLE "queue_limits" (
   "base_url" TEXT,
   "model" TEXT,
   "limit_tokens" INTEGER,
   "exact" INTEGER,
   "source" TEXT,
   "ts" TEXT,
   PRIMARY KEY ("base_url", "model")
);

CREATE TABLE "savings" (
   "seq" INTEGER PRIMARY KEY,
   "job_id" TEXT,
   "model" TEXT,
   "day" TEXT,
   "ts" TEXT,
   "rows" INTEGER,
   "saved_usd" REAL,
   "sandbox" INTEGER
);

CREATE INDEX "idx_savings_day"
    ON "savings" ("day");

CREATE TABLE "batch_runs" (
   "batch_id" TEXT PRIMARY KEY,
   "job_id" TEXT,
   "model" TEXT,
   "sandbox" INTEGER,
   "requests" INTEGER,
   "seconds" REAL,
   "ts" TEXT
);

CREATE INDEX "idx_batch_runs_model_ts"
    ON "batch_runs" ("model", "ts");
