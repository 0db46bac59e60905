{{/*
Names, labels and shared settings of the fedtune chart.
Label layout follows KubeRay's helm-chart/ray-cluster: app.kubernetes.io/{name,instance,version,
component,managed-by}, helm.sh/chart, app.kubernetes.io/part-of.
*/}}

{{/* Chart name, truncated to a DNS label. */}}
{{- define "fedtune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name prefix of every object, at most 40 characters so that the longest derived name
(`<fullname>-ray-head-svc`, made by KubeRay from the RayCluster name) stays a 63-character DNS
label. A longer name is cut to 33 characters plus `-` and 6 hex digits of its SHA-256, so two
releases whose names share their first 40 characters never collide.
*/}}
{{- define "fedtune.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- $full = .Release.Name -}}
{{- else -}}
{{- $full = printf "%s-%s" .Release.Name $name -}}
{{- end -}}
{{- end -}}
{{- if gt (len $full) 40 -}}
{{- printf "%s-%s" ($full | trunc 33 | trimSuffix "-") (sha256sum $full | trunc 6) -}}
{{- else -}}
{{- $full | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* helm.sh/chart label value. */}}
{{- define "fedtune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "api"). */}}
{{- define "fedtune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fedtune.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Full label set of one component: call with (dict "ctx" $ "component" "api"). */}}
{{- define "fedtune.labels" -}}
helm.sh/chart: {{ include "fedtune.chart" .ctx }}
{{ include "fedtune.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | replace "+" "_" | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: fedtune
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Image reference: call with (dict "ctx" $ "override" <{repository, tag} or nil>). */}}
{{- define "fedtune.image" -}}
{{- $override := .override | default dict -}}
{{- $repository := default .ctx.Values.image.repository $override.repository -}}
{{- $tag := default (default .ctx.Chart.AppVersion .ctx.Values.image.tag) $override.tag -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* ServiceAccount of the API pods. */}}
{{- define "fedtune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fedtune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* ServiceAccount of RayJob pods (FEDTUNE_K8S_SERVICE_ACCOUNT); empty when none. */}}
{{- define "fedtune.jobServiceAccountName" -}}
{{- $sa := .Values.kubernetesBackend.serviceAccount -}}
{{- if $sa.create -}}
{{- default (printf "%s-job" (include "fedtune.fullname" .)) $sa.name -}}
{{- else -}}
{{- $sa.name -}}
{{- end -}}
{{- end -}}

{{/* Secret with FEDTUNE_DATABASE_URL, MLFLOW_TRACKING_URI, MLFLOW_BACKEND_STORE_URI. */}}
{{- define "fedtune.envSecretName" -}}
{{- default (printf "%s-env" (include "fedtune.fullname" .)) .Values.secret.existingSecret -}}
{{- end -}}

{{/* Secret of RayJob study drivers (FEDTUNE_K8S_ENV_SECRET): FEDTUNE_DATABASE_URL and MLFLOW_TRACKING_URI only. */}}
{{- define "fedtune.driverSecretName" -}}
{{- if .Values.secret.existingSecret -}}
{{- .Values.secret.existingDriverSecret -}}
{{- else -}}
{{- printf "%s-driver" (include "fedtune.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Standard container securityContext of chart-made containers that have no value of their own (Pod Security "restricted"). */}}
{{- define "fedtune.restrictedContainer" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Whether the containers that start the code sandbox get the chart's Localhost seccomp profile. */}}
{{- define "fedtune.sandboxSeccomp" -}}
{{- $c := .Values.codeUpload -}}
{{- if and $c.enabled (eq $c.sandbox "bwrap") $c.seccomp.localhostProfile -}}
{{- if or (has ".." (splitList "/" $c.seccomp.localhostProfile)) (hasPrefix "/" $c.seccomp.localhostProfile) -}}
{{- fail "codeUpload.seccomp.localhostProfile: a path inside the kubelet's seccomp root (no leading / and no ..)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* securityContext `sc` of a container that starts the code sandbox (the API, the Ray head):
its own, with the chart's Localhost seccomp profile when code upload runs bubblewrap. Args: dict
"ctx" (root context) "sc" (the container's securityContext value). */}}
{{- define "fedtune.sandboxSecurityContext" -}}
{{- $sc := deepCopy .sc -}}
{{- if include "fedtune.sandboxSeccomp" .ctx -}}
{{- $_ := set $sc "seccompProfile" (dict "type" "Localhost" "localhostProfile" .ctx.Values.codeUpload.seccomp.localhostProfile) -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Resource memory quantity in MiB (float): "16Gi" -> 16384. Plain numbers are bytes. */}}
{{- define "fedtune.memoryMi" -}}
{{- $q := toString . -}}
{{- $num := regexReplaceAll "^([0-9.]+).*$" $q "${1}" | float64 -}}
{{- $unit := regexReplaceAll "^[0-9.]+" $q "" -}}
{{- $factor := dict "Ki" (divf 1 1024) "Mi" 1.0 "Gi" 1024.0 "Ti" 1048576.0 "k" (divf 1000 1048576) "K" (divf 1000 1048576) "M" (divf 1000000 1048576) "G" (divf 1000000000 1048576) "T" (divf 1000000000000 1048576) "" (divf 1 1048576) -}}
{{- mulf $num (get $factor $unit | default 0.0) -}}
{{- end -}}

{{/* Secret with the API token: auth.existingSecret, else the chart's own (auth.apiToken, or one
generated when neither it nor OIDC is configured: the API is never open); empty only with OIDC and
no token. */}}
{{- define "fedtune.authSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if or .Values.auth.apiToken (not .Values.auth.oidc.issuer) -}}
{{- printf "%s-auth" (include "fedtune.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The API token of the chart's own Secret: auth.apiToken, else fedtune.stableRandom. */}}
{{- define "fedtune.apiToken" -}}
{{- if .Values.auth.apiToken -}}
{{- .Values.auth.apiToken -}}
{{- else -}}
{{- include "fedtune.stableRandom" (dict "ctx" . "memo" "apiToken" "secret" (printf "%s-auth" (include "fedtune.fullname" .)) "key" "api-token" "values" "auth.apiToken (or auth.existingSecret, or auth.oidc.issuer)") -}}
{{- end -}}
{{- end -}}

{{- define "fedtune.authSecretKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}api-token{{- end -}}
{{- end -}}

{{- define "fedtune.postgresql.fullname" -}}
{{- printf "%s-postgresql" (include "fedtune.fullname" .) -}}
{{- end -}}

{{- define "fedtune.postgresql.secretName" -}}
{{- default (include "fedtune.postgresql.fullname" .) .Values.postgresql.auth.existingSecret -}}
{{- end -}}


{{/*
A generated secret that stays stable: (dict "ctx" $ "memo" <key> "secret" <Secret name> "key" <data key> "values" <value names for the message>).
Computed once per render (memoised in .Values.__fedtuneGenerated): the value stored in the
release's Secret (lookup; stable across upgrades), else — only on a first install against a live
cluster — 32 random alphanumerics. An offline render (`helm template`, GitOps tools,
`--dry-run=client`: `lookup` answers nothing) or an upgrade whose Secret is gone fails instead:
a value that changes on every render would lock the services out of their data. "Live" means
`lookup` sees the namespace's `default` ServiceAccount.
*/}}
{{- define "fedtune.stableRandom" -}}
{{- $ctx := .ctx -}}
{{- $memo := $ctx.Values.__fedtuneGenerated | default dict -}}
{{- if not (hasKey $memo .memo) -}}
{{- $existing := lookup "v1" "Secret" $ctx.Release.Namespace .secret -}}
{{- $stored := dig "data" .key "" $existing -}}
{{- $live := lookup "v1" "ServiceAccount" $ctx.Release.Namespace "default" -}}
{{- if $stored -}}
{{- $_ := set $memo .memo (b64dec $stored) -}}
{{- else if and $ctx.Release.IsInstall $live -}}
{{- $_ := set $memo .memo (randAlphaNum 32) -}}
{{- else -}}
{{- fail (printf "%s is required: the chart cannot read a generated value back from Secret %s (offline render such as `helm template` or a GitOps tool, or an upgrade whose Secret is gone); pass the same value on every install and upgrade, e.g. `openssl rand -hex 24`" .values .secret) -}}
{{- end -}}
{{- $_ := set $ctx.Values "__fedtuneGenerated" $memo -}}
{{- end -}}
{{- get $memo .memo -}}
{{- end -}}

{{/* Superuser password of the bundled PostgreSQL: the value given, else fedtune.stableRandom. */}}
{{- define "fedtune.postgresql.password" -}}
{{- if .Values.postgresql.auth.password -}}
{{- .Values.postgresql.auth.password -}}
{{- else -}}
{{- include "fedtune.stableRandom" (dict "ctx" . "memo" "postgresqlPassword" "secret" (include "fedtune.postgresql.fullname" .) "key" "password" "values" "postgresql.auth.password (or postgresql.auth.existingSecret with secret.existingSecret)") -}}
{{- end -}}
{{- end -}}

{{/* Secret holding the Ray token (key auth_token) of the shared RayCluster. */}}
{{- define "fedtune.rayAuthSecretName" -}}
{{- default (printf "%s-ray-auth" (include "fedtune.fullname" .)) .Values.rayCluster.auth.existingSecret -}}
{{- end -}}

{{/* Ray token of the shared RayCluster when the chart owns its Secret. */}}
{{- define "fedtune.rayAuthToken" -}}
{{- if .Values.rayCluster.auth.token -}}
{{- .Values.rayCluster.auth.token -}}
{{- else -}}
{{- include "fedtune.stableRandom" (dict "ctx" . "memo" "rayAuthToken" "secret" (include "fedtune.rayAuthSecretName" .) "key" "auth_token" "values" "rayCluster.auth.token (or rayCluster.auth.existingSecret)") -}}
{{- end -}}
{{- end -}}

{{/* Whether the shared RayCluster uses token authentication ("true" or ""). */}}
{{- define "fedtune.rayAuthEnabled" -}}
{{- if and .Values.rayCluster.enabled .Values.rayCluster.auth.enabled -}}true{{- end -}}
{{- end -}}

{{/*
Password of one login role of the bundled PostgreSQL (`fedtune` or `mlflow`), derived from the
superuser password with SHA-256, so the user keeps one secret while each service only ever sees
its own role's password (which does not reveal the superuser's or the other role's).
*/}}
{{- define "fedtune.postgresql.rolePassword" -}}
{{- printf "fedtune-role:%s:%s" .role (include "fedtune.postgresql.password" .ctx) | sha256sum | trunc 40 -}}
{{- end -}}

{{/* SQLAlchemy URL of one role's database of the bundled PostgreSQL: (dict "ctx" $ "role" "fedtune"|"mlflow"). */}}
{{- define "fedtune.postgresql.url" -}}
{{- $pg := .ctx.Values.postgresql -}}
{{- $user := ternary $pg.auth.username $pg.auth.mlflowUsername (eq .role "fedtune") -}}
{{- $database := ternary $pg.auth.database $pg.auth.mlflowDatabase (eq .role "fedtune") -}}
{{- printf "postgresql+psycopg://%s:%s@%s:%d/%s" $user (include "fedtune.postgresql.rolePassword" .) (include "fedtune.postgresql.fullname" .ctx) (int $pg.service.port) $database -}}
{{- end -}}

{{/* FEDTUNE_DATABASE_URL when the chart generates the env Secret. */}}
{{- define "fedtune.databaseUrl" -}}
{{- if .Values.postgresql.enabled -}}
{{- include "fedtune.postgresql.url" (dict "ctx" . "role" "fedtune") -}}
{{- else -}}
{{- required "externalDatabase.url is required when postgresql.enabled is false and secret.existingSecret is not set" .Values.externalDatabase.url -}}
{{- end -}}
{{- end -}}

{{/* MLFLOW_BACKEND_STORE_URI when the chart generates the env Secret. */}}
{{- define "fedtune.mlflowBackendStoreUri" -}}
{{- if .Values.postgresql.enabled -}}
{{- include "fedtune.postgresql.url" (dict "ctx" . "role" "mlflow") -}}
{{- else -}}
{{- required "externalDatabase.mlflowUrl is required when mlflow.enabled is true, postgresql.enabled is false and secret.existingSecret is not set" .Values.externalDatabase.mlflowUrl -}}
{{- end -}}
{{- end -}}

{{- define "fedtune.mlflow.fullname" -}}
{{- printf "%s-mlflow" (include "fedtune.fullname" .) -}}
{{- end -}}

{{/* MLFLOW_TRACKING_URI seen from inside the cluster; empty when there is none. */}}
{{- define "fedtune.mlflowTrackingUri" -}}
{{- if .Values.mlflow.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "fedtune.mlflow.fullname" .) .Release.Namespace (int .Values.mlflow.service.port) -}}
{{- else -}}
{{- .Values.mlflow.trackingUri -}}
{{- end -}}
{{- end -}}

{{/*
mlflow.publicUrl as MLflow's Host and origin checks see it, computed as `fedtune mlflow-server
--public-url` does (fedtune/service/mlflow_access.py): JSON {"hosts": [the Host headers a browser
sends, with the port; also the bare host for the scheme's own port], "origin": the UI's Origin};
{} when it is empty.
*/}}
{{- define "fedtune.mlflowPublic" -}}
{{- with .Values.mlflow.publicUrl -}}
{{- $u := urlParse . -}}
{{- $scheme := lower $u.scheme -}}
{{- $own := ternary "443" "80" (eq $scheme "https") -}}
{{- $host := trimSuffix (printf ":%s" $own) (lower $u.host) -}}
{{- $hosts := list $host -}}
{{- if not (regexMatch ":[0-9]+$" $host) -}}
{{- $hosts = append $hosts (printf "%s:%s" $host $own) -}}
{{- end -}}
{{- dict "hosts" $hosts "origin" (printf "%s://%s" $scheme $host) | toJson -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* Name of the shared RayCluster; KubeRay names its head Service `<this>-head-svc`. */}}
{{- define "fedtune.rayCluster.name" -}}
{{- printf "%s-ray" (include "fedtune.fullname" .) -}}
{{- end -}}

{{/* RAY_ADDRESS for backend `ray`. */}}
{{- define "fedtune.rayAddress" -}}
{{- if .Values.rayCluster.enabled -}}
{{- printf "http://%s-head-svc.%s.svc:8265" (include "fedtune.rayCluster.name" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.ray.address -}}
{{- end -}}
{{- end -}}

{{/* FEDTUNE_K8S_WORKER_TEMPLATE: the non-empty fields of kubernetesBackend.workerTemplate as JSON. */}}
{{- define "fedtune.workerTemplateJson" -}}
{{- $out := dict -}}
{{- range $key, $value := .Values.kubernetesBackend.workerTemplate -}}
{{- if $value -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Cross-field checks that values.schema.json cannot express; each failure names the values involved.
*/}}
{{- define "fedtune.validate" -}}
{{- if and (eq .Values.backend "ray") (not .Values.rayCluster.enabled) (not .Values.ray.address) -}}
{{- fail "backend=ray needs a Ray cluster: set rayCluster.enabled=true or ray.address" -}}
{{- end -}}
{{- if and .Values.kueue.enabled (ne .Values.backend "kubernetes") -}}
{{- fail "kueue.enabled needs backend=kubernetes: Kueue admits the studies' RayJobs" -}}
{{- end -}}
{{- if gt (int .Values.api.replicas) 1 -}}
{{- if eq .Values.backend "local" -}}
{{- fail "api.replicas > 1 needs backend ray or kubernetes: with backend=local the study drivers are processes of one API pod, which the other pods cannot see" -}}
{{- end -}}
{{- if and (not .Values.postgresql.enabled) (hasPrefix "sqlite" .Values.externalDatabase.url) -}}
{{- fail "api.replicas > 1 needs PostgreSQL: SQLite is single-process (the scheduler's leader lease lives in PostgreSQL)" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.postgresql.enabled .Values.postgresql.auth.existingSecret (not .Values.secret.existingSecret) -}}
{{- fail "postgresql.auth.existingSecret is set: the chart cannot read that password to build database URLs, so set secret.existingSecret too" -}}
{{- end -}}
{{- if and .Values.mlflow.enabled (eq .Values.mlflow.artifacts.type "pvc") (gt (int .Values.mlflow.replicas) 1) -}}
{{- fail "mlflow.replicas > 1 needs mlflow.artifacts.type=s3: the artifact PVC is ReadWriteOnce" -}}
{{- end -}}
{{- if and .Values.mlflow.enabled (eq .Values.mlflow.artifacts.type "s3") (not .Values.mlflow.artifacts.s3.bucket) -}}
{{- fail "mlflow.artifacts.type=s3 needs mlflow.artifacts.s3.bucket" -}}
{{- end -}}
{{- with .Values.auth.apiToken -}}
{{- if or (lt (len .) 16) (regexMatch "\\s" .) -}}
{{- fail "auth.apiToken: use at least 16 random characters without whitespace (the service refuses shorter tokens), e.g. `openssl rand -hex 32`; better, auth.existingSecret" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.secret.existingSecret (eq .Values.backend "kubernetes") (not .Values.secret.existingDriverSecret) -}}
{{- fail "secret.existingDriverSecret is required with secret.existingSecret and backend=kubernetes: a Secret with only FEDTUNE_DATABASE_URL and MLFLOW_TRACKING_URI for study drivers (they must not see MLflow's database credentials)" -}}
{{- end -}}
{{- if .Values.rayCluster.enabled -}}
{{- include "fedtune.validateWorkerGroup" (dict "path" "rayCluster.worker" "group" .Values.rayCluster.worker) -}}
{{- range $name, $group := .Values.rayCluster.additionalWorkerGroups -}}
{{- include "fedtune.validateWorkerGroup" (dict "path" (printf "rayCluster.additionalWorkerGroups.%s" $name) "group" $group) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fedtune.validateWorkerGroup" -}}
{{- $g := .group -}}
{{- if not $g.disabled -}}
{{- $limits := dig "limits" dict ($g.resources | default dict) -}}
{{- if or (not (get $limits "cpu")) (not (get $limits "memory")) -}}
{{- fail (printf "%s.resources.limits: cpu and memory are required (KubeRay derives Ray's num-cpus and memory from them; without them a trial pod may take a whole node)" .path) -}}
{{- end -}}
{{- $gpus := int (get $limits "nvidia.com/gpu" | default 0) -}}
{{- if gt $gpus 0 -}}
{{- $need := addf (mulf $gpus 8192.0) (include "fedtune.memoryMi" ($g.shmSize | default "0")) -}}
{{- if lt (include "fedtune.memoryMi" $limits.memory | float64) $need -}}
{{- fail (printf "%s.resources.limits.memory (%s) must be at least 8Gi per GPU (%d) plus shmSize (%s)" .path (toString $limits.memory) $gpus (toString ($g.shmSize | default "0"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) -}}
{{- fail (printf "%s: minReplicas (%d) must not exceed maxReplicas (%d)" .path (int $g.minReplicas) (int $g.maxReplicas)) -}}
{{- end -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "%s: replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)" .path (int $g.replicas) (int $g.minReplicas) (int $g.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{/* HOME of every fedtune container: the image user's home is on the read-only root file
system, and Ray (~/.ray), matplotlib and others write below $HOME; /tmp is always a volume. */}}
{{- define "fedtune.homeEnv" -}}
- name: HOME
  value: /tmp
{{- end -}}

{{/* Hardened container volumes shared by fedtune pods: a writable /tmp on a read-only root. */}}
{{- define "fedtune.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end -}}

{{/* Whether MLflow runs with one workspace per project and its basic-auth app ("true" or ""): mlflow.workspaces.enabled, or when that is null, whether auth is on. */}}
{{- define "fedtune.mlflowWorkspaces" -}}
{{- $w := .Values.mlflow.workspaces.enabled -}}
{{- $authOn := true -}}{{- /* the API is never open: a token is configured, generated, or OIDC is on */ -}}
{{- if and .Values.mlflow.enabled (or (eq (toString $w) "true") (and (kindIs "invalid" $w) $authOn)) -}}true{{- end -}}
{{- end -}}

{{/* Secret holding MLflow's admin password (key fedtune.mlflowAuthSecretKey). */}}
{{- define "fedtune.mlflowAuthSecretName" -}}
{{- default (printf "%s-mlflow-auth" (include "fedtune.fullname" .)) .Values.mlflow.auth.existingSecret -}}
{{- end -}}

{{- define "fedtune.mlflowAuthSecretKey" -}}
{{- ternary .Values.mlflow.auth.existingSecretKey "admin-password" (ne .Values.mlflow.auth.existingSecret "") -}}
{{- end -}}

{{/*
MLflow's admin password when the chart owns its Secret: mlflow.auth.adminPassword, else derived
from the bundled PostgreSQL's superuser password (SHA-256, like the database roles' passwords),
else generated once (fedtune.stableRandom).
*/}}
{{- define "fedtune.mlflowAdminPassword" -}}
{{- if .Values.mlflow.auth.adminPassword -}}
{{- .Values.mlflow.auth.adminPassword -}}
{{- else if and .Values.postgresql.enabled (not .Values.postgresql.auth.existingSecret) -}}
{{- printf "fedtune-mlflow-admin:%s" (include "fedtune.postgresql.password" .) | sha256sum | trunc 40 -}}
{{- else -}}
{{- include "fedtune.stableRandom" (dict "ctx" . "memo" "mlflowAdminPassword" "secret" (include "fedtune.mlflowAuthSecretName" .) "key" "admin-password" "values" "mlflow.auth.adminPassword (or mlflow.auth.existingSecret)") -}}
{{- end -}}
{{- end -}}
