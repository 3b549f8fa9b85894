{{/*
Names and labels, as `helm create` makes them, so that Cube's chart can use
this one as a subchart (nameOverride, fullnameOverride) without clashes.
*/}}
{{- define "cube-templatecenter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cube-templatecenter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cube-templatecenter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cube-templatecenter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cube-templatecenter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cube-templatecenter.labels" -}}
helm.sh/chart: {{ include "cube-templatecenter.chart" . }}
{{ include "cube-templatecenter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: templatecenter
app.kubernetes.io/part-of: cube-sandbox
{{- end }}

{{- define "cube-templatecenter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cube-templatecenter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cube-templatecenter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Paths inside the container. Every writable one is a volume: the root
filesystem is read-only.
*/}}
{{- define "cube-templatecenter.configDir" -}}/etc/cube-templatecenter{{- end }}
{{- define "cube-templatecenter.spoolDir" -}}/var/lib/cube-templatecenter{{- end }}
{{- define "cube-templatecenter.storeDir" -}}{{ .Values.persistence.store.mountPath }}{{- end }}
{{- define "cube-templatecenter.workDir" -}}/var/cache/cube-templatecenter{{- end }}
{{- define "cube-templatecenter.secretDir" -}}/run/secrets/cube-templatecenter{{- end }}

{{/*
shutdownSeconds: TC's shutdown.timeout, kept shutdownMarginSeconds below
the grace period so that the report flush ends before Kubernetes kills.
*/}}
{{- define "cube-templatecenter.shutdownSeconds" -}}
{{- sub (int .Values.terminationGracePeriodSeconds) (int .Values.shutdownMarginSeconds) }}
{{- end }}

{{/*
validate fails `helm template` and `helm install` on values that would
deploy something that cannot work. The replica rules are the project's
(docs/operations.md, "Several replicas"): replicas share artifacts through
the blob store and coordinate builds through CubeMaster's database.
*/}}
{{- define "cube-templatecenter.validate" -}}
{{- $v := .Values }}
{{- $replicas := int $v.replicaCount }}
{{- $backend := $v.artifactStore.backend | default "" }}
{{- if not (has $backend (list "" "s3" "fs")) }}
{{- fail (printf "artifactStore.backend %q: want \"\", s3 or fs" $backend) }}
{{- end }}
{{- if and (eq $backend "s3") (not (and $v.artifactStore.s3.endpoint $v.artifactStore.s3.bucket)) }}
{{- fail "artifactStore.backend s3 needs artifactStore.s3.endpoint and artifactStore.s3.bucket" }}
{{- end }}
{{- if gt $replicas 1 }}
{{- $shared := eq $backend "s3" }}
{{- if and (eq $backend "fs") $v.artifactStore.fs.existingClaim (has "ReadWriteMany" $v.artifactStore.fs.accessModes) }}
{{- $shared = true }}
{{- end }}
{{- if not $shared }}
{{- fail (printf "replicaCount %d needs a shared blob store: set artifactStore.backend s3 (with s3.endpoint and s3.bucket), or fs with artifactStore.fs.existingClaim on a ReadWriteMany volume; without one, replicas cannot see each other's artifacts" $replicas) }}
{{- end }}
{{- if not (and $v.database.driver $v.database.addr) }}
{{- fail (printf "replicaCount %d needs CubeMaster's database: set database.driver and database.addr (instance_db_config); replicas coordinate their builds through it" $replicas) }}
{{- end }}
{{- end }}
{{- if not (has ($v.database.driver | default "") (list "" "mysql" "postgres")) }}
{{- fail (printf "database.driver %q: want mysql or postgres" $v.database.driver) }}
{{- end }}
{{- if and $v.database.driver (not (and $v.database.addr $v.database.user $v.database.dbName)) }}
{{- fail "database.driver is set: database.addr (host:port), database.user and database.dbName are needed too" }}
{{- end }}
{{- if lt (int (include "cube-templatecenter.shutdownSeconds" .)) 1 }}
{{- fail (printf "terminationGracePeriodSeconds %v must exceed shutdownMarginSeconds %v: TC needs time to requeue builds and flush reports" $v.terminationGracePeriodSeconds $v.shutdownMarginSeconds) }}
{{- end }}
{{- if not (has $v.secrets.mount (list "file" "env")) }}
{{- fail (printf "secrets.mount %q: want file or env" $v.secrets.mount) }}
{{- end }}
{{- if not (has $v.podAntiAffinity.type (list "soft" "hard" "none")) }}
{{- fail (printf "podAntiAffinity.type %q: want soft, hard or none" $v.podAntiAffinity.type) }}
{{- end }}
{{- if not (has $v.persistence.store.type (list "pvc" "emptyDir" "existingClaim")) }}
{{- fail (printf "persistence.store.type %q: want pvc, emptyDir or existingClaim" $v.persistence.store.type) }}
{{- end }}
{{- if eq $v.persistence.store.type "existingClaim" }}
{{- if not $v.persistence.store.existingClaim }}
{{- fail "persistence.store.type existingClaim needs persistence.store.existingClaim (e.g. CubeMaster's artifact claim)" }}
{{- end }}
{{- if gt $replicas 1 }}
{{- fail (printf "replicaCount %d with persistence.store.type existingClaim: each replica needs a store of its own (pvc or emptyDir), with S3 holding the shared copy" $replicas) }}
{{- end }}
{{- end }}
{{- if not (has $v.persistence.workDir.type (list "pvc" "emptyDir")) }}
{{- fail (printf "persistence.workDir.type %q: want pvc or emptyDir" $v.persistence.workDir.type) }}
{{- end }}
{{- end }}

{{/*
secretRefs lists the referenced secrets as YAML: the variable TC reads, the
Secret and its key. Only those with an existingSecret appear.
*/}}
{{- define "cube-templatecenter.secretRefs" -}}
{{- $s := .Values.secrets }}
{{- $refs := list }}
{{- with $s.callbackToken.existingSecret }}
{{- $refs = append $refs (dict "env" "CUBE_TEMPLATE_CALLBACK_TOKEN" "secret" . "key" $s.callbackToken.key) }}
{{- end }}
{{- with $s.s3.existingSecret }}
{{- $refs = append $refs (dict "env" "CUBE_S3_ACCESS_KEY_ID" "secret" . "key" $s.s3.accessKeyIdKey) }}
{{- $refs = append $refs (dict "env" "CUBE_S3_SECRET_ACCESS_KEY" "secret" . "key" $s.s3.secretAccessKeyKey) }}
{{- with $s.s3.sessionTokenKey }}
{{- $refs = append $refs (dict "env" "CUBE_S3_SESSION_TOKEN" "secret" $s.s3.existingSecret "key" .) }}
{{- end }}
{{- end }}
{{- with $s.databasePassword.existingSecret }}
{{- $refs = append $refs (dict "env" "CUBE_TEMPLATE_CENTER_DB_PASSWORD" "secret" . "key" $s.databasePassword.key) }}
{{- end }}
{{- with $s.redisPassword.existingSecret }}
{{- $refs = append $refs (dict "env" "CUBE_TEMPLATE_CENTER_REDIS_PASSWORD" "secret" . "key" $s.redisPassword.key) }}
{{- end }}
{{- with $s.recordSecret.existingSecret }}
{{- $refs = append $refs (dict "env" "CUBE_TEMPLATE_CENTER_RECORD_SECRET" "secret" . "key" $s.recordSecret.key) }}
{{- end }}
{{- toYaml $refs }}
{{- end }}

{{/*
config renders conf.yaml: .Values.config, with the keys the chart owns
(listener, paths, log format, shutdown, blob store, database, Redis) laid
over it.
*/}}
{{- define "cube-templatecenter.config" -}}
{{- $v := .Values }}
{{- $conf := deepCopy ($v.config | default dict) }}
{{- $own := dict
  "common" (dict "http_bind" "0.0.0.0" "http_port" (int $v.containerPort))
  "log" (dict "format" "json")
  "master" (dict "addr" $v.master.addr)
  "store" (dict "dir" (include "cube-templatecenter.storeDir" .) "work_dir" (include "cube-templatecenter.workDir" .))
  "spool" (dict "path" (printf "%s/spool.db" (include "cube-templatecenter.spoolDir" .)))
  "shutdown" (dict "timeout" (printf "%ss" (include "cube-templatecenter.shutdownSeconds" .)))
}}
{{- $as := $v.artifactStore }}
{{- if eq $as.backend "s3" }}
{{- $s3 := dict "endpoint" $as.s3.endpoint "bucket" $as.s3.bucket "use_path_style" $as.s3.usePathStyle "use_ssl" $as.s3.useSSL }}
{{- with $as.s3.region }}{{ $_ := set $s3 "region" . }}{{ end }}
{{- with $as.s3.prefix }}{{ $_ := set $s3 "prefix" . }}{{ end }}
{{- $_ := set $own "artifact_store" (dict "backend" "s3" "s3" $s3) }}
{{- else if eq $as.backend "fs" }}
{{- $fs := dict "backend" "fs" }}
{{- if $as.fs.existingClaim }}{{ $_ := set $fs "fs_root" $as.fs.root }}{{ end }}
{{- $_ := set $own "artifact_store" $fs }}
{{- end }}
{{- $db := $v.database }}
{{- if $db.driver }}
{{- $idc := dict "driver" $db.driver "addr" $db.addr "user" $db.user "db_name" $db.dbName }}
{{- with $db.sslmode }}{{ $_ := set $idc "sslmode" . }}{{ end }}
{{- with $db.tls }}{{ $_ := set $idc "tls" . }}{{ end }}
{{- $_ := set $own "instance_db_config" $idc }}
{{- end }}
{{- if $v.redis.nodes }}
{{- $r := dict "nodes" $v.redis.nodes "db_no" (int $v.redis.dbNo) }}
{{- with $v.redis.tls }}{{ $_ := set $r "tls" . }}{{ end }}
{{- $_ := set $own "redis" $r }}
{{- end }}
{{- toYaml (mergeOverwrite $conf $own) }}
{{- end }}
