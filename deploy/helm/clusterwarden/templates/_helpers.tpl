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

{{/* Ready when one of the Kafka bootstrap servers accepts a TCP connection: the services
without a health endpoint cannot do their work without the broker. Not a liveness probe:
a broker outage must not restart every service. */}}
{{- define "clusterwarden.brokerProbe" -}}
exec:
  command:
    - python
    - -c
    - |
      import os, socket, sys
      def reachable(server):
          host, _, port = server.strip().rpartition(":")
          try:
              socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
          except (OSError, ValueError):
              return False
          return True
      sys.exit(0 if any(map(reachable, os.environ["KAFKA_BOOTSTRAP_SERVERS"].split(","))) else 1)
periodSeconds: {{ .Values.brokerProbe.periodSeconds }}
timeoutSeconds: {{ .Values.brokerProbe.timeoutSeconds }}
failureThreshold: {{ .Values.brokerProbe.failureThreshold }}
{{- end -}}

{{/* The API's liveness and readiness: its /healthz (no token needed). */}}
{{- define "clusterwarden.apiProbe" -}}
httpGet:
  path: /healthz
  port: http
initialDelaySeconds: {{ .Values.apiProbe.initialDelaySeconds }}
periodSeconds: {{ .Values.apiProbe.periodSeconds }}
timeoutSeconds: {{ .Values.apiProbe.timeoutSeconds }}
failureThreshold: {{ .Values.apiProbe.failureThreshold }}
{{- end -}}
