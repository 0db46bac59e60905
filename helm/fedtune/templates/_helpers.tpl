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
Full name prefix of every object. Truncated to 40 characters so that the longest derived name
(`<fullname>-ray-head-svc`, made by KubeRay from the RayCluster name) stays a 63-character DNS label.
*/}}
{{- define "fedtune.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
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

{{/* Secret with the API token; empty when no token is configured. */}}
{{- define "fedtune.authSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if .Values.auth.apiToken -}}
{{- printf "%s-auth" (include "fedtune.fullname" .) -}}
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

{{- define "fedtune.postgresql.secretKey" -}}
{{- if .Values.postgresql.auth.existingSecret -}}{{ .Values.postgresql.auth.existingSecretKey }}{{- else -}}password{{- end -}}
{{- end -}}

{{/*
Password of the bundled PostgreSQL, computed once per render and shared by every template:
the value given, else the one stored in the release's Secret (lookup; stable across upgrades),
else a fresh random one (first install; `helm template` always takes this branch).
*/}}
{{- define "fedtune.postgresql.password" -}}
{{- if .Values.postgresql.auth.password -}}
{{- .Values.postgresql.auth.password -}}
{{- else -}}
{{- $memo := .Values.__fedtuneGenerated | default dict -}}
{{- if not (hasKey $memo "postgresqlPassword") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "fedtune.postgresql.fullname" .) -}}
{{- $stored := dig "data" "password" "" $existing -}}
{{- $_ := set $memo "postgresqlPassword" (ternary (b64dec $stored) (randAlphaNum 32) (ne $stored "")) -}}
{{- $_ := set .Values "__fedtuneGenerated" $memo -}}
{{- end -}}
{{- get $memo "postgresqlPassword" -}}
{{- end -}}
{{- end -}}

{{/* SQLAlchemy URL of one database of the bundled PostgreSQL: (dict "ctx" $ "database" "fedtune"). */}}
{{- define "fedtune.postgresql.url" -}}
{{- $pg := .ctx.Values.postgresql -}}
{{- printf "postgresql+psycopg://%s:%s@%s:%d/%s" $pg.auth.username (include "fedtune.postgresql.password" .ctx) (include "fedtune.postgresql.fullname" .ctx) (int $pg.service.port) .database -}}
{{- end -}}

{{/* FEDTUNE_DATABASE_URL when the chart generates the env Secret. */}}
{{- define "fedtune.databaseUrl" -}}
{{- if .Values.postgresql.enabled -}}
{{- include "fedtune.postgresql.url" (dict "ctx" . "database" .Values.postgresql.auth.database) -}}
{{- else -}}
{{- required "externalDatabase.url is required when postgresql.enabled is false and secret.existingSecret is not set" .Values.externalDatabase.url -}}
{{- end -}}
{{- end -}}

{{/* MLFLOW_BACKEND_STORE_URI when the chart generates the env Secret. */}}
{{- define "fedtune.mlflowBackendStoreUri" -}}
{{- if .Values.postgresql.enabled -}}
{{- include "fedtune.postgresql.url" (dict "ctx" . "database" .Values.postgresql.auth.mlflowDatabase) -}}
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
{{- if and .Values.postgresql.enabled .Values.postgresql.auth.existingSecret (not .Values.secret.existingSecret) -}}
{{- fail "postgresql.auth.existingSecret is set: the chart cannot read that password to build database URLs, so set secret.existingSecret too" -}}
{{- end -}}
{{- if and .Values.mlflow.enabled (eq .Values.mlflow.artifacts.type "pvc") (gt (int .Values.mlflow.replicas) 1) -}}
{{- fail "mlflow.replicas > 1 needs mlflow.artifacts.type=s3: the artifact PVC is ReadWriteOnce" -}}
{{- end -}}
{{- if and .Values.mlflow.enabled (eq .Values.mlflow.artifacts.type "s3") (not .Values.mlflow.artifacts.s3.bucket) -}}
{{- fail "mlflow.artifacts.type=s3 needs mlflow.artifacts.s3.bucket" -}}
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
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) -}}
{{- fail (printf "%s: minReplicas (%d) must not exceed maxReplicas (%d)" .path (int $g.minReplicas) (int $g.maxReplicas)) -}}
{{- end -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "%s: replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)" .path (int $g.replicas) (int $g.minReplicas) (int $g.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{/* Hardened container volumes shared by fedtune pods: a writable /tmp on a read-only root. */}}
{{- define "fedtune.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end -}}
