// Settings: the project's secrets, API keys and webhooks.
import ApiKeys from "./settings/ApiKeys";
import Secrets from "./settings/Secrets";
import Webhooks from "./settings/Webhooks";
import "./settings/settings.css";

export default function Settings() {
  return (
    <>
      <h1>Settings</h1>
      <Secrets />
      <ApiKeys />
      <Webhooks />
    </>
  );
}
