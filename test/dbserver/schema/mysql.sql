-- CubeMaster's tables as TC sees them (MySQL 8 / MariaDB 10.11): a stand-in
-- for tests, column names and meanings as CubeMaster's, types our choice.
-- See the project's reference on CubeMaster's database; keep postgres.sql in step.

CREATE TABLE t_cube_template_image_job (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  job_id VARCHAR(64) NOT NULL,
  template_id VARCHAR(128) NOT NULL DEFAULT '',
  request_id VARCHAR(128) NOT NULL DEFAULT '',
  attempt_no INT NOT NULL DEFAULT 1,
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
  progress INT NOT NULL DEFAULT 0,
  error_message TEXT,
  expected_node_count INT NOT NULL DEFAULT 0,
  ready_node_count INT NOT NULL DEFAULT 0,
  failed_node_count INT NOT NULL DEFAULT 0,
  template_status VARCHAR(32) NOT NULL DEFAULT '',
  artifact_status VARCHAR(32) NOT NULL DEFAULT '',
  pull_total_bytes BIGINT NOT NULL DEFAULT 0,
  pull_downloaded_bytes BIGINT NOT NULL DEFAULT 0,
  pull_total_layers INT NOT NULL DEFAULT 0,
  pull_completed_layers INT NOT NULL DEFAULT 0,
  pull_speed_bps BIGINT NOT NULL DEFAULT 0,
  request_json LONGTEXT,                   -- sanitized snapshot: registry_password blanked
  result_json LONGTEXT,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  deleted_at DATETIME(3) NULL,
  UNIQUE KEY idx_job_id (job_id)
);

CREATE TABLE t_cube_rootfs_artifact (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
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
  generated_request_json LONGTEXT,
  writable_layer_size VARCHAR(32) NOT NULL DEFAULT '',
  download_token VARCHAR(64) NOT NULL DEFAULT '',
  status VARCHAR(32) NOT NULL,             -- PENDING BUILDING READY FAILED CLEANUP_PENDING DELETING ORPHANED
  last_error TEXT,
  gc_deadline DATETIME(3) NULL,
  artifact_url TEXT,
  storage_backend VARCHAR(16) NOT NULL DEFAULT '',   -- '' (shared disk), 's3' or 'fs'
  object_key VARCHAR(1024) NOT NULL DEFAULT '',
  cube_egress_ca_baked TINYINT(1) NOT NULL DEFAULT 0,
  cube_egress_ca_fingerprint VARCHAR(64) NOT NULL DEFAULT '',
  cube_egress_ca_targets_written INT NOT NULL DEFAULT 0,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  deleted_at DATETIME(3) NULL,
  UNIQUE KEY idx_artifact_id (artifact_id),
  UNIQUE KEY idx_artifact_fingerprint (template_spec_fingerprint)
);
