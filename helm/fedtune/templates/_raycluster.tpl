{{/*
One KubeRay worker group: (dict "ctx" $ "name" <groupName> "group" <values> "image" <ref> "envSecret" <name>).
Value names mirror WorkerGroupSpec fields; GPUs are `nvidia.com/gpu` in resources (KubeRay derives num-gpus).
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
          envFrom:
            - secretRef:
                name: {{ .envSecret }}
          {{- with $g.env }}
          env:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          resources:
            {{- toYaml $g.resources | nindent 12 }}
          securityContext:
            {{- toYaml $g.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir: {}
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
