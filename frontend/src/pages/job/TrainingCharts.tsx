// The trainer's curves: loss and its acceptance estimate per step, per-position accuracy, and
// validation per epoch. All of them are the trainer's numbers (estimates), not served ones.
import { CartesianGrid, Legend, Line, LineChart, Tooltip, XAxis, YAxis } from "recharts";
import { AXIS, ChartCard, DOT, colorAt, tooltipNumber } from "./ChartCard";
import type { Row, TrainingSeries } from "./metrics";

function StepLine({ data, dataKey, name, color }: { data: Row[]; dataKey: string; name: string; color: string }) {
  return (
    <LineChart data={data} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
      <CartesianGrid stroke="#eef1f5" />
      <XAxis dataKey="step" type="number" domain={["dataMin", "dataMax"]} tick={AXIS} label={{ value: "step", position: "insideBottom", offset: -8, ...AXIS }} />
      <YAxis tick={AXIS} width={48} domain={["auto", "auto"]} />
      <Tooltip formatter={tooltipNumber} labelFormatter={(step) => `step ${step}`} />
      <Line type="monotone" dataKey={dataKey} name={name} stroke={color} dot={DOT} isAnimationActive={false} />
    </LineChart>
  );
}

export function TrainingCharts({ series, running }: { series: TrainingSeries; running: boolean }) {
  const waiting = running ? "yet" : "for this job";
  return (
    <div className="grid2 charts">
      <ChartCard label="Training loss" isEmpty={series.loss.length === 0} empty={`No training metrics ${waiting}.`}>
        <StepLine data={series.loss} dataKey="loss" name="train/loss" color={colorAt(0)} />
      </ChartCard>

      <ChartCard
        label="Acceptance estimate (eal)"
        hint="The trainer's estimate of the acceptance length (train/eal); the served evaluation measures the real one."
        isEmpty={series.eal.length === 0}
        empty={`No acceptance estimate ${waiting}.`}
      >
        <StepLine data={series.eal} dataKey="eal" name="train/eal (estimate)" color={colorAt(1)} />
      </ChartCard>

      <ChartCard
        label="Per-position acceptance (training estimate)"
        hint="The trainer's accuracy at each draft position (train/position_K_acc)."
        isEmpty={series.positions.length === 0}
        empty={`No per-position metrics ${waiting}.`}
        height={260}
      >
        <LineChart data={series.positions} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
          <CartesianGrid stroke="#eef1f5" />
          <XAxis dataKey="step" type="number" domain={["dataMin", "dataMax"]} tick={AXIS} />
          <YAxis tick={AXIS} width={48} domain={[0, 1]} />
          <Tooltip formatter={tooltipNumber} labelFormatter={(step) => `step ${step}`} />
          <Legend wrapperStyle={{ fontSize: 12 }} />
          {series.positionKeys.map((key, i) => (
            <Line
              key={key}
              type="monotone"
              dataKey={key}
              name={`position ${key.slice(1)}`}
              stroke={colorAt(i)}
              dot={DOT}
              strokeWidth={1.5}
              isAnimationActive={false}
            />
          ))}
        </LineChart>
      </ChartCard>

      <ChartCard
        label="Validation per epoch"
        hint="Validation loss (left axis) and the trainer's eal estimate (right axis) after each epoch."
        isEmpty={series.validation.length === 0}
        empty={`No validation metrics ${running ? "yet: they come after each epoch" : "for this job"}.`}
        height={260}
      >
        <LineChart data={series.validation} margin={{ top: 8, right: 4, bottom: 16, left: 0 }}>
          <CartesianGrid stroke="#eef1f5" />
          <XAxis dataKey="epoch" type="number" domain={["dataMin", "dataMax"]} allowDecimals={false} tick={AXIS} label={{ value: "epoch", position: "insideBottom", offset: -8, ...AXIS }} />
          <YAxis yAxisId="loss" tick={AXIS} width={48} domain={["auto", "auto"]} />
          <YAxis yAxisId="eal" orientation="right" tick={AXIS} width={40} domain={["auto", "auto"]} />
          <Tooltip formatter={tooltipNumber} labelFormatter={(epoch) => `epoch ${epoch}`} />
          <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
          <Line yAxisId="loss" type="monotone" dataKey="loss" name="val/loss_epoch" stroke={colorAt(0)} dot={{ r: 3 }} isAnimationActive={false} connectNulls />
          <Line yAxisId="eal" type="monotone" dataKey="eal" name="val/eal_epoch (estimate)" stroke={colorAt(1)} dot={{ r: 3 }} isAnimationActive={false} connectNulls />
        </LineChart>
      </ChartCard>
    </div>
  );
}
