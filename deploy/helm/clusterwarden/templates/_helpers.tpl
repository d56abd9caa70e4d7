{{/* The release's name prefix: <release>, or <release>-clusterwarden when the release name
does not say it (cluster-wide objects carry it, so two releases never collide). */}}
{{- define "clusterwarden.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "clusterwarden.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "<name>"). */}}
{{- define "clusterwarden.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "clusterwarden.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "clusterwarden.backendServiceAccount" -}}
{{- .Values.backendServiceAccount.name | default (printf "%s-backend" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.agentServiceAccount" -}}
{{- .Values.agentServiceAccount.name | default (printf "%s-agent" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.inventoryServiceAccount" -}}
{{- .Values.inventoryServiceAccount.name | default (printf "%s-inventory" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.connectionsSecret" -}}
{{- .Values.connectionsSecret | default (printf "%s-connections" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.keysSecret" -}}
{{- .Values.keysSecret | default (printf "%s-keys" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.tokensSecret" -}}
{{- .Values.tokensSecret | default (printf "%s-api-tokens" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{/* How each process runs, as warden/launcher.py's service_command runs it (FastStream's
runner with the service's app factory; the API under uvicorn). */}}
{{- define "clusterwarden.command" -}}
{{- if eq . "api" -}}
["python", "-m", "services.api"]
{{- else -}}
["faststream", "run", "services.{{ . }}.app:create_app", "--factory"]
{{- end -}}
{{- end -}}

{{/* The probes of every process, on its container port named .port (the API's "http", every
other service's "health"): liveness on /livez (a background loop or a consumer ended, or the
event loop is stuck: a restart helps), readiness on /readyz (start-up finished, and the broker,
Redis and the database answer as far as the process needs them; an outage of theirs takes the
pods out of service and restarts none). Call with (dict "root" $ "port" "<name>"). */}}
{{- define "clusterwarden.probes" -}}
{{- $probes := .root.Values.probes -}}
livenessProbe:
  httpGet:
    path: /livez
    port: {{ .port }}
  {{- toYaml $probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  {{- toYaml $probes.readiness | nindent 2 }}
{{- end -}}
