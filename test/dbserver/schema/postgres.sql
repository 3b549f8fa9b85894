-- CubeMaster's tables as TC sees them (PostgreSQL 15): mysql.sql translated
-- column for column: BIGSERIAL ids, TEXT for LONGTEXT, TIMESTAMPTZ with now()
-- for DATETIME(3), BOOLEAN for TINYINT(1), unique keys as unique indexes.

CREATE TABLE t_cube_template_image_job (
  id BIGSERIAL PRIMARY KEY,
  job_id VARCHAR(64) NOT NULL,
  template_id VARCHAR(128) NOT NULL DEFAULT '',
  request_id VARCHAR(128) NOT NULL DEFAULT '',
  attempt_no INTEGER NOT NULL DEFAULT 1,
  retry_of_job_id VARCHAR(64) NOT NULL DEFAULT '',
  operation VARCHAR(32) NOT NULL DEFAULT 'CREATE',
  redo_mode VARCHAR(32) NOT NULL DEFAULT '',
  redo_scope_json TEXT,
  resume_phase VARCHAR(32) NOT NULL DEFAULT '',
  artifact_id VARCHAR(128) NOT NULL DEFAULT '',
  template_spec_fingerprint VARCHAR(64) NOT NULL DEFAULT '',
  source_image_ref VARCHAR(1024) NOT NULL DEFAULT '',
  source_image_digest VARCHAR(1024) NOT NULL DEFAULT '',
  writable_layer_size VARCHAR(32) NOT NULL DEFAULT '',
  instance_type VARCHAR(64) NOT NULL DEFAULT '',
  network_type VARCHAR(64) NOT NULL DEFAULT '',
  status VARCHAR(32) NOT NULL,             -- PENDING RUNNING BUILT READY FAILED
  phase VARCHAR(32) NOT NULL DEFAULT '',
  progress INTEGER NOT NULL DEFAULT 0,
  error_message TEXT,
  expected_node_count INTEGER NOT NULL DEFAULT 0,
  ready_node_count INTEGER NOT NULL DEFAULT 0,
  failed_node_count INTEGER NOT NULL DEFAULT 0,
  template_status VARCHAR(32) NOT NULL DEFAULT '',
  artifact_status VARCHAR(32) NOT NULL DEFAULT '',
  pull_total_bytes BIGINT NOT NULL DEFAULT 0,
  pull_downloaded_bytes BIGINT NOT NULL DEFAULT 0,
  pull_total_layers INTEGER NOT NULL DEFAULT 0,
  pull_completed_layers INTEGER NOT NULL DEFAULT 0,
  pull_speed_bps BIGINT NOT NULL DEFAULT 0,
  request_json TEXT,                       -- sanitized snapshot: registry_password blanked
  result_json TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  deleted_at TIMESTAMPTZ NULL
);
CREATE UNIQUE INDEX idx_job_id ON t_cube_template_image_job (job_id);

CREATE TABLE t_cube_rootfs_artifact (
  id BIGSERIAL PRIMARY KEY,
  artifact_id VARCHAR(128) NOT NULL,
  template_spec_fingerprint VARCHAR(64) NOT NULL,
  source_image_ref VARCHAR(1024) NOT NULL DEFAULT '',
  source_image_digest VARCHAR(1024) NOT NULL DEFAULT '',
  master_node_id VARCHAR(128) NOT NULL DEFAULT '',
  master_node_ip VARCHAR(255) NOT NULL DEFAULT '',
  ext4_path VARCHAR(1024) NOT NULL DEFAULT '',
  ext4_sha256 VARCHAR(64) NOT NULL DEFAULT '',
  ext4_size_bytes BIGINT NOT NULL DEFAULT 0,
  image_config_json TEXT,
  generated_request_json TEXT,
  writable_layer_size VARCHAR(32) NOT NULL DEFAULT '',
  download_token VARCHAR(64) NOT NULL DEFAULT '',
  status VARCHAR(32) NOT NULL,             -- PENDING BUILDING READY FAILED CLEANUP_PENDING DELETING ORPHANED
  last_error TEXT,
  gc_deadline TIMESTAMPTZ NULL,
  artifact_url TEXT,
  storage_backend VARCHAR(16) NOT NULL DEFAULT '',   -- '' (shared disk), 's3' or 'fs'
  object_key VARCHAR(1024) NOT NULL DEFAULT '',
  cube_egress_ca_baked BOOLEAN NOT NULL DEFAULT FALSE,
  cube_egress_ca_fingerprint VARCHAR(64) NOT NULL DEFAULT '',
  cube_egress_ca_targets_written INTEGER NOT NULL DEFAULT 0,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  deleted_at TIMESTAMPTZ NULL
);
CREATE UNIQUE INDEX idx_artifact_id ON t_cube_rootfs_artifact (artifact_id);
CREATE UNIQUE INDEX idx_artifact_fingerprint ON t_cube_rootfs_artifact (template_spec_fingerprint);
