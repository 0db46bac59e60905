{{/* Image of one worker group: its own `image` fields, else rayCluster.image's, else `image`'s. */}}
{{- define "fedtune.groupImage" -}}
{{- $ctx := .ctx -}}
{{- $own := .group.image | default dict -}}
{{- $rc := $ctx.Values.rayCluster.image | default dict -}}
{{- $repository := default (default $ctx.Values.image.repository $rc.repository) $own.repository -}}
{{- $tag := default (default (default $ctx.Chart.AppVersion $ctx.Values.image.tag) $rc.tag) $own.tag -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/*
One KubeRay worker group: (dict "ctx" $ "name" <groupName> "group" <values> "image" <ref>).
Value names mirror WorkerGroupSpec fields; GPUs are `nvidia.com/gpu` resource limits (KubeRay
derives num-gpus). Trials get no database credentials: only the (credential-free) MLflow URL.
*/}}
{{- define "fedtune.rayWorkerGroup" -}}
{{- $g := .group -}}
- groupName: {{ .name }}
  replicas: {{ $g.replicas }}
  minReplicas: {{ $g.minReplicas }}
  maxReplicas: {{ $g.maxReplicas }}
  rayStartParams: {{- include "fedtune.rayStartParams" $g.rayStartParams | nindent 4 }}
  template:
    metadata:
      labels:
        {{- include "fedtune.labels" (dict "ctx" .ctx "component" "ray-worker") | nindent 8 }}
        {{- with $g.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $g.annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      # Trials need no Kubernetes API access.
      automountServiceAccountToken: false
      {{- with .ctx.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $g.podSecurityContext | nindent 8 }}
      containers:
        - name: ray-worker
          image: {{ .image | quote }}
          imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
          env:
            {{- include "fedtune.homeEnv" . | nindent 12 }}
            {{- with include "fedtune.mlflowTrackingUri" .ctx }}
            - name: MLFLOW_TRACKING_URI
              value: {{ . | quote }}
            {{- end }}
            {{- with $g.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          resources:
            {{- toYaml $g.resources | nindent 12 }}
          securityContext:
            {{- toYaml $g.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: dshm
              mountPath: /dev/shm
      volumes:
        - name: tmp
          emptyDir: {}
        # Ray's object store and torch DataLoader workers use /dev/shm (counted as pod memory).
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $g.shmSize | default "2Gi" }}
      {{- with $g.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $g.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $g.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}


{{/* rayStartParams as a map of strings (the CRD's type); `{}` when empty. */}}
{{- define "fedtune.rayStartParams" -}}
{{- $params := dict -}}
{{- range $key, $value := . -}}
{{- $_ := set $params $key (toString $value) -}}
{{- end -}}
{{- if $params -}}
{{- toYaml $params -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}
